"""Test doubles shared by the test suites (servers on 127.0.0.1, scripted backends)."""
