from hpcstack.cli import main
import sys
sys.exit(main())
