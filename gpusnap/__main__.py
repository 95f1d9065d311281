from gpusnap.cli import main

main()
