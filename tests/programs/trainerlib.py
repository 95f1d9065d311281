"""What a library ships, outside the program's directory, so gpusnap does not instrument it.
Used by frameworks/wrapped_loop.py."""


def retrying(function, *args, attempts=3):
    """Calls ``function`` again when it raises, as a library's retry decorator does."""
    while True:
        try:
            return function(*args)
        except RuntimeError:
            attempts -= 1
            if not attempts:
                raise
