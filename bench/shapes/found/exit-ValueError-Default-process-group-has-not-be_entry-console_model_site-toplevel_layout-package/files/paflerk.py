import sys

from plecait.staithin import thaind

if __name__ == "__main__":
    sys.exit(thaind())
