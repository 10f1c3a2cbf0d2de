"""Task templates: one module per domain; each function decorated with `@template`."""
