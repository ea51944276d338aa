"""``python -m vllm_blockfp8 ...``: the same CLI as the ``blockfp8`` console script."""

from .cli import main

raise SystemExit(main())
