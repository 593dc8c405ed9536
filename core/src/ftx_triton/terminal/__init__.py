"""What ftx shows: the one stderr console, log rendering, progress bars and redaction of secrets."""
