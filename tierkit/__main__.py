import sys

from tierkit.cli import main

sys.exit(main())
