"""Repository-rule helpers: index lookup and lock writers (standard library only)."""
