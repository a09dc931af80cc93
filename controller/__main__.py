from controller.cli.main import entry

entry()
