from pecli.cli.app import main

main()
