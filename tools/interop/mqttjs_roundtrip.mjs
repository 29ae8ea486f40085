// MQTT.js as the second peer of `make interop`: subscribe at QoS 2, publish QoS 0, 1, 2; prints
// "ok ..." when each arrives once at its QoS. Run from build/interop (its node_modules):
// node mqttjs_roundtrip.mjs PORT VERSION USER TOPIC
import mqtt from 'mqtt'

const [port, v, user, base] = process.argv.slice(2)
const got = []
const fail = (m) => { console.log(String(m)); process.exit(1) }
setTimeout(() => fail('timed out; received ' + JSON.stringify(got)), 10000)
const c = mqtt.connect({
  host: '127.0.0.1', port: Number(port), protocolVersion: Number(v), reconnectPeriod: 0, connectTimeout: 5000,
  clientId: 'js' + Math.random().toString(16).slice(2, 10), username: user || undefined, password: user ? 'x' : undefined
})
c.on('error', (e) => fail('error: ' + e.message))
c.on('message', (t, p, pk) => {
  got.push([p.toString(), pk.qos])
  if (got.length === 3) {
    setTimeout(() => {
      got.sort()
      const ok = JSON.stringify(got) === JSON.stringify([['q0', 0], ['q1', 1], ['q2', 2]])
      console.log(ok ? 'ok QoS 0/1/2 each once at its QoS' : 'received (payload, QoS) ' + JSON.stringify(got))
      c.end(true, () => process.exit(ok ? 0 : 1))
    }, 300)
  }
})
c.on('connect', async () => {
  try {
    await c.subscribeAsync(base + '/#', { qos: 2 })
    for (const q of [0, 1, 2]) await c.publishAsync(base + '/' + q, 'q' + q, { qos: q })
  } catch (e) { fail('error: ' + e.message) }
})
