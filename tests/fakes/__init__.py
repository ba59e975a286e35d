"""Test doubles: fake upstream servers and other stand-ins for parts that cannot run here."""
