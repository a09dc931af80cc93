from controller.cli import entry

entry()
