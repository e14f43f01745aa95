from jbkv_cli.cli import main

main()
