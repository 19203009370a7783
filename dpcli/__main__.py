"""`python -m dpcli` entry point."""

from dpcli.cli.app import main

if __name__ == "__main__":
    main()
