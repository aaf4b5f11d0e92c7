from warmd.cli import main

main()
