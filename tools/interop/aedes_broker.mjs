// aedes on 127.0.0.1:PORT for `make interop` (node aedes_broker.mjs PORT), run with NODE_PATH at
// build/interop/node_modules. Prints "ready" once listening.
import { createServer } from 'node:net'
import { Aedes } from 'aedes'

const port = Number(process.argv[2])
const broker = await Aedes.createBroker()
const server = createServer(broker.handle)
server.listen(port, '127.0.0.1', () => console.log('ready'))
process.on('SIGTERM', () => { server.close(); broker.close(() => process.exit(0)) })
