import sys

from realtime.cli import main

sys.exit(main())
