import sys

from kubectl_fiar.cli import main

sys.exit(main())
