from jbkv_cli.cli.entry import main

main()
