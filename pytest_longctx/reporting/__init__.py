"""Reports built from records alone: Markdown, HTML, plots, benchmark JSON."""
