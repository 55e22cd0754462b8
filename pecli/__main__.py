from pecli.cli import main

main()
