"""``python bench/celery_compare [--help]``: run the side-by-side comparison."""

import sys
from pathlib import Path

# bench/ (for the package) instead of this folder, which Python put first
sys.path[0] = str(Path(__file__).resolve().parent.parent)

from celery_compare.driver import main  # noqa: E402

raise SystemExit(main())
