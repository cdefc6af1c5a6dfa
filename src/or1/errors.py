"""Errors a user can cause. The CLI prints them as one line and exits with code 2; everything else stays loud."""


class UserError(Exception):
    """Bad input the user can fix: a missing file, an unknown config key, a malformed row. One sentence."""
