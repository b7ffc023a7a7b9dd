"""Code shared by every recall service: the embedded engine and the common plumbing."""
