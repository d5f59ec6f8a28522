from realtime.launch.cli import run

run()
