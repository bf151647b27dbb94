"""Shared fixtures. The ckptio pytest plugin (ckptio.testing.plugin) is loaded through its
entry point; fixtures here are the project's own."""
