"""Float64 reference implementations written from the papers' equations (plain loops, dense masks)."""
