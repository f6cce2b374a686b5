from mmserver.cli import main

main()
