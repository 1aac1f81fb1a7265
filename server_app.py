"""pubswap-flwr ServerApp: reads the run config and runs the mode's protocol (fedavg | fedprox | pubswap | sapo)."""

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from pubswap_flwr.server.app import run

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    run(grid, context)
