"""The server's request and response path: tokenization and detokenization."""
