from realtime.cli import run

run()
