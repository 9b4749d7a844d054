from benchmarks.load.main import main

main()
