"""What every report's renderers share, below the workloads' report sections and the report
shell alike: tables as text and the length axis of every plot."""
