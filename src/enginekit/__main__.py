from enginekit.cli import main

main()
