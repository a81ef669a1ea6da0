from b12x.cli import main

raise SystemExit(main())
