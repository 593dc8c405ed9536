"""What a run is: the user's choices (settings), the records stages pass (artifacts), the context
hooks receive, the resource estimate. Every layer reads these; they import no layer above them."""
