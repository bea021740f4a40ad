import sys

from streamlab.cli import main

sys.exit(main())
