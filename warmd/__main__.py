from warmd.cli import main

main(prog_name="warmd")
