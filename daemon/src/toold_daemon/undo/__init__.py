"""Undo: pre-images of what mutating calls change, and putting them back."""
