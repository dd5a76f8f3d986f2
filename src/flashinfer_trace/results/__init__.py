"""What runs leave behind: case records, their streams, the session folders' files."""
