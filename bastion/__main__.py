import sys

from bastion.cli.main import main

sys.exit(main())
