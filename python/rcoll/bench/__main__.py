"""python -m rcoll.bench: the same as python -m rcoll bench."""
import sys

from rcoll.bench import main

if __name__ == "__main__":
    sys.exit(main())
