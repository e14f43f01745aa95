from jbkv_cli.entry import main

main()
