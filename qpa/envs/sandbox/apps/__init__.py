"""Sandbox apps: one module per app; each defines an `App` subclass with `@tool` methods."""
