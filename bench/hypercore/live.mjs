// Hypercore 11's side of bench/bench_vs_hypercore.py: live propagation over one hop.
//
//   node live.mjs --samples 300 --interval 10 --variant default|fsync
//
// Two processes, like latticed's two daemons: this one (the reader) forks a writer. The writer owns a core
// in a storage directory of its own and serves `core.replicate(false)` (Noise-encrypted, the analogue of
// our secure channel) on a TCP socket on 127.0.0.1; the reader opens the same key in a second directory,
// dials it and pipes `core.replicate(true)` to the socket. After a warm-up block, the writer appends one
// 100-byte block, waits for append() to resolve, sleeps --interval ms and repeats (the pacing of
// bench_replication's live part: offer, then sleep). The reader keeps a live download range open and,
// on each 'append' event, get()s every new block; a block's latency is the moment its get() resolves
// minus the writer's append-start time, which the writer puts in the block itself.
//
// One clock: both processes read process.hrtime.bigint(), which is libuv's uv_hrtime(), i.e.
// clock_gettime(CLOCK_MONOTONIC) on Linux: one system-wide clock, so timestamps taken in two processes on
// the same host compare directly (Python's time.perf_counter() reads the same clock, so latticed's figures
// in the same run are on it too). performance.timeOrigin is not used: it is per process.
//
// Durability. Hypercore 11 stores cores in RocksDB (hypercore-storage over rocksdb-native), and
// rocksdb-native writes every batch with RocksDB's default WriteOptions (sync = false): an append is in
// the WAL in the page cache, not on disk, when append() resolves and when it is replicated; nothing in
// Hypercore's API asks for a synced write. So:
//   --variant default  Hypercore as shipped: no fsync on append.
//   --variant fsync    the writer also fdatasyncs RocksDB's current WAL file after each append (what
//                      WriteOptions.sync = true would do) before sleeping. Hypercore still replicates the
//                      block as soon as it is appended, without waiting for that flush (there is no hook
//                      to hold a block back until it is durable), so the reader's figure is not "forwarded
//                      only once durable" as latticed's is; the writer reports append start -> durable
//                      separately (`durable_ms`), and `held_ms` = max(reader's arrival, writer durable)
//                      per block is a lower bound for what holding each block back until durable would
//                      cost.
//
// Prints one JSON object on stdout: {variant, samples, latency_ms, append_ms, durable_ms, held_ms}, each
// list indexed by block (1..samples).

import { fork } from 'node:child_process'
import { once } from 'node:events'
import fs from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { parseArgs } from 'node:util'
import Hypercore from 'hypercore'

const RECORD_BYTES = 100

const { values: args } = parseArgs({
  options: {
    samples: { type: 'string', default: '300' },
    interval: { type: 'string', default: '10' },
    variant: { type: 'string', default: 'default' },
    role: { type: 'string', default: 'reader' },
    dir: { type: 'string' }
  }
})
const samples = Number(args.samples)
const intervalMs = Number(args.interval)
if (!['default', 'fsync'].includes(args.variant)) throw new Error(`unknown --variant ${args.variant}`)

const now = () => process.hrtime.bigint()
const ms = (ns) => Number(ns) / 1e6
const sleep = (delay) => new Promise((resolve) => setTimeout(resolve, delay))

function replicateOver(core, socket, isInitiator) {
  // No Nagle: Hypercore normally runs over UDX (hyperswarm), which does not batch small writes; over TCP
  // Nagle + delayed ACKs hold its small messages back ~40 ms. latticed runs on trio.SocketStream, which
  // sets TCP_NODELAY.
  socket.setNoDelay(true)
  const stream = core.replicate(isInitiator, { keepAlive: false })
  stream.pipe(socket).pipe(stream)
  // A peer that goes away ends the run (the reader closes first): not an error worth a stack trace.
  stream.on('error', () => {})
  socket.on('error', () => {})
  return stream
}

function block(index, startedNs) {
  const buf = Buffer.alloc(RECORD_BYTES, 0x78)
  buf.writeBigUInt64LE(startedNs, 0)
  buf.writeUInt32LE(index, 8)
  return buf
}

// fdatasync of the WAL file RocksDB is writing now; reopened when RocksDB moves to a new one.
function walSyncer(storage) {
  let open = { path: null, handle: null }
  return async () => {
    const wal = await storage.rocks.currentWalFile()
    const file = path.join(storage.rocks.path, wal.path) // relative to the WAL directory, with a leading /
    if (open.path !== file) {
      if (open.handle) await open.handle.close()
      open = { path: file, handle: await fs.promises.open(file, 'r') }
    }
    await open.handle.datasync()
  }
}

async function writer() {
  const storage = Hypercore.defaultStorage(path.join(args.dir, 'writer'))
  const core = new Hypercore(storage)
  await core.ready()
  await core.append(block(0, now()))
  const syncWal = args.variant === 'fsync' ? walSyncer(storage) : null
  if (syncWal) await syncWal()

  const server = net.createServer((socket) => replicateOver(core, socket, false))
  server.listen(0, '127.0.0.1')
  await once(server, 'listening')
  process.send({ key: core.key.toString('hex'), port: server.address().port })

  const [start] = await once(process, 'message')
  if (start !== 'start') throw new Error(`writer: unexpected ${start}`)
  const appendMs = []
  const durableMs = []
  for (let i = 1; i <= samples; i++) {
    const started = now()
    await core.append(block(i, started))
    appendMs.push(ms(now() - started))
    if (syncWal) {
      await syncWal()
      durableMs.push(ms(now() - started))
    }
    await sleep(intervalMs)
  }
  process.send({ appendMs, durableMs })
  await once(process, 'message') // the reader has every block: stop
  await core.close()
  await storage.close()
  process.exit(0) // the replication socket would otherwise keep the process up
}

async function reader() {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'hc-bench-'))
  const child = fork(fileURLToPath(import.meta.url), [...process.argv.slice(2), '--role', 'writer', '--dir', dir])
  let stopping = false
  child.on('exit', (code) => {
    if (stopping) return
    console.error(`live.mjs: the writer exited early (${code})`)
    fs.rmSync(dir, { recursive: true, force: true })
    process.exit(1)
  })
  try {
    const [hello] = await once(child, 'message')
    const core = new Hypercore(path.join(dir, 'reader'), Buffer.from(hello.key, 'hex'))
    await core.ready()
    const socket = net.connect(hello.port, '127.0.0.1')
    replicateOver(core, socket, true)
    await core.get(0) // warm-up: the session is up and block 0 is here
    core.download({ start: 0, end: -1 }) // live range: fetch every new block as soon as it is known

    const latency = new Array(samples + 1).fill(null)
    let next = 1
    let received = 0
    let allHere
    const done = new Promise((resolve) => {
      allHere = resolve
    })
    core.on('append', () => {
      for (; next < core.length && next <= samples; next++) {
        const index = next
        core.get(index).then((buf) => {
          const arrived = now()
          latency[index] = ms(arrived - buf.readBigUInt64LE(0))
          if (++received === samples) allHere()
        })
      }
    })
    const writerDone = once(child, 'message')
    child.send('start')
    await done
    const [{ appendMs, durableMs }] = await writerDone
    stopping = true
    child.send('stop')
    await once(child, 'exit')
    await core.close()
    socket.destroy()

    const lat = latency.slice(1)
    const held = durableMs.length ? lat.map((l, i) => Math.max(l, durableMs[i])) : []
    process.stdout.write(
      JSON.stringify({
        variant: args.variant,
        samples,
        interval_ms: intervalMs,
        latency_ms: lat,
        append_ms: appendMs,
        durable_ms: durableMs,
        held_ms: held
      }) + '\n'
    )
  } finally {
    if (child.exitCode === null) child.kill()
    fs.rmSync(dir, { recursive: true, force: true })
  }
}

if (args.role === 'writer') await writer()
else await reader()
