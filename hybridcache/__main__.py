from hybridcache.cli import main

raise SystemExit(main())
