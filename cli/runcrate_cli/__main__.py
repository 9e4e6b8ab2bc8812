from runcrate_cli.cli import main

main()
