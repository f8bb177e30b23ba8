"""`python -m eaglewire.cli ...` (torchrun's `-m eaglewire.cli train ...`): the same app as `eaglewire`."""

from eaglewire.cli.app import main

if __name__ == "__main__":
    main()
