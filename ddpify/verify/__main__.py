from ddpify.verify.cli import verify_command

verify_command(prog_name="python -m ddpify.verify")
