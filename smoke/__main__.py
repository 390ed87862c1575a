import sys

from smoke.cli import main

sys.exit(main())
