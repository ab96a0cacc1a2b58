"""The shared vocabulary: sizes, the records schema every report reads, statistics, files."""
