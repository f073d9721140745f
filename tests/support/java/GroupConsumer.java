// A Kafka group consumer (Apache Kafka's Java client) for tests, driven and read by tests/support/java_consumer.py.
//
// Launched as `java -cp <kafka jars>/*:<classes> GroupConsumer --bootstrap B --group G --topic T [...]`.
// stdout is a line protocol, one event per line, fields separated by one space:
//   STARTED <client id>
//   ASSIGNED <topic-partition,...>       partitions added to this member (eager assignors: the whole assignment)
//   REVOKED <topic-partition,...>        partitions taken away before a rebalance
//   LOST <topic-partition,...>           partitions lost without a revoke (session expired, fenced)
//   RECORD <topic> <partition> <offset> <key>   (key "-" when null)
//   COMMITTED <topic-partition=next offset,...>  after each commitSync
//   COMMIT_FAILED <exception class> <message>
//   ERROR <exception class> <message>
//   CLOSED                               consumer.close() returned (LeaveGroup sent)
// Auto-commit is off; every poll that returns records is committed with commitSync before the next poll.
// Exits cleanly (consumer.close(), so the member leaves the group) when stdin closes, on SIGTERM, or after
// --max-records records. Client logging goes to stderr at WARN.
import java.io.InputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;

public final class GroupConsumer {
    private static final Map<String, String> ASSIGNORS = Map.of(
        "range", "org.apache.kafka.clients.consumer.RangeAssignor",
        "roundrobin", "org.apache.kafka.clients.consumer.RoundRobinAssignor",
        "sticky", "org.apache.kafka.clients.consumer.StickyAssignor",
        "cooperative-sticky", "org.apache.kafka.clients.consumer.CooperativeStickyAssignor");

    private static final Object OUT = new Object();

    static void emit(String line) {
        synchronized (OUT) {
            System.out.println(line);
            System.out.flush();
        }
    }

    static String partitions(Collection<TopicPartition> partitions) {
        List<String> names = new ArrayList<>();
        for (TopicPartition tp : partitions) names.add(tp.topic() + "-" + tp.partition());
        names.sort(null);
        return String.join(",", names);
    }

    static String oneLine(Throwable error) {
        String message = String.valueOf(error.getMessage()).replace('\n', ' ');
        return error.getClass().getSimpleName() + " " + message;
    }

    static Map<String, String> parse(String[] args) {
        Map<String, String> options = new HashMap<>();
        List<String> properties = new ArrayList<>();
        for (int i = 0; i < args.length; i++) {
            String name = args[i];
            if (!name.startsWith("--") || i + 1 >= args.length) usage("bad argument: " + name);
            String value = args[++i];
            if (name.equals("--property")) properties.add(value);
            else options.put(name.substring(2), value);
        }
        options.put("property", String.join("\n", properties));
        for (String required : List.of("bootstrap", "group", "topic")) {
            if (!options.containsKey(required)) usage("missing --" + required);
        }
        return options;
    }

    static void usage(String problem) {
        System.err.println(problem);
        System.err.println("usage: GroupConsumer --bootstrap HOST:PORT --group G --topic T[,T2] [--assignor "
            + String.join("|", new java.util.TreeSet<>(ASSIGNORS.keySet())) + "] [--session-timeout-ms N] [--heartbeat-interval-ms N]"
            + " [--group-protocol classic|consumer] [--remote-assignor uniform|range]"
            + " [--max-poll-interval-ms N] [--max-records N] [--client-id ID] [--group-instance-id ID]"
            + " [--auto-offset-reset earliest|latest] [--property NAME=VALUE]...");
        System.exit(2);
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> options = parse(args);
        String assignor = options.getOrDefault("assignor", "range");
        boolean classic = options.getOrDefault("group-protocol", "classic").equals("classic");
        if (classic && !ASSIGNORS.containsKey(assignor)) usage("unknown assignor " + assignor);
        long maxRecords = Long.parseLong(options.getOrDefault("max-records", "-1"));

        Properties config = new Properties();
        config.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, options.get("bootstrap"));
        config.put(ConsumerConfig.GROUP_ID_CONFIG, options.get("group"));
        config.put(ConsumerConfig.CLIENT_ID_CONFIG, options.getOrDefault("client-id", "java-group-consumer"));
        if (!classic) {
            // KIP-848: the coordinator owns the assignor, session timeout and heartbeat interval
            config.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
            config.put(ConsumerConfig.GROUP_REMOTE_ASSIGNOR_CONFIG, options.getOrDefault("remote-assignor", "uniform"));
        } else {
            config.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, ASSIGNORS.get(assignor));
            config.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, options.getOrDefault("session-timeout-ms", "10000"));
            config.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, options.getOrDefault("heartbeat-interval-ms", "1000"));
        }
        config.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG,
            options.getOrDefault("max-poll-interval-ms", "300000"));
        config.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, options.getOrDefault("auto-offset-reset", "earliest"));
        config.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        config.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        config.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        if (options.containsKey("group-instance-id")) {
            config.put(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, options.get("group-instance-id"));
        }
        for (String property : options.get("property").split("\n")) {
            if (property.isEmpty()) continue;
            int eq = property.indexOf('=');
            if (eq < 1) usage("--property wants NAME=VALUE, got " + property);
            config.put(property.substring(0, eq), property.substring(eq + 1));
        }

        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(config);
        AtomicBoolean stopping = new AtomicBoolean(false);
        CountDownLatch closed = new CountDownLatch(1);
        Runnable stop = () -> {
            stopping.set(true);
            consumer.wakeup();
        };
        Thread stdinWatcher = new Thread(() -> {
            try {
                InputStream in = System.in;
                while (in.read() != -1) { /* any input is ignored; EOF means stop */ }
            } catch (Exception ignored) {
                // a broken stdin means the test went away: stop as well
            }
            stop.run();
        }, "stdin-watcher");
        stdinWatcher.setDaemon(true);
        stdinWatcher.start();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {  // SIGTERM: close before the JVM exits
            stop.run();
            try {
                closed.await();
            } catch (InterruptedException ignored) {
                Thread.currentThread().interrupt();
            }
        }, "sigterm"));

        int status = 0;
        try {
            consumer.subscribe(List.of(options.get("topic").split(",")), new ConsumerRebalanceListener() {
                @Override public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    emit("REVOKED " + partitions(partitions));
                }
                @Override public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    emit("ASSIGNED " + partitions(partitions));
                }
                @Override public void onPartitionsLost(Collection<TopicPartition> partitions) {
                    emit("LOST " + partitions(partitions));
                }
            });
            emit("STARTED " + config.get(ConsumerConfig.CLIENT_ID_CONFIG));
            long consumed = 0;
            while (!stopping.get() && (maxRecords < 0 || consumed < maxRecords)) {
                ConsumerRecords<String, String> records = consumer.poll(Duration.ofMillis(500));
                if (records.isEmpty()) continue;
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> record : records) {
                    emit("RECORD " + record.topic() + " " + record.partition() + " " + record.offset() + " "
                        + (record.key() == null ? "-" : record.key()));
                    offsets.put(new TopicPartition(record.topic(), record.partition()),
                        new OffsetAndMetadata(record.offset() + 1));
                    consumed++;
                }
                try {
                    consumer.commitSync(offsets);
                    List<String> committed = new ArrayList<>();
                    for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
                        committed.add(e.getKey().topic() + "-" + e.getKey().partition() + "=" + e.getValue().offset());
                    }
                    committed.sort(null);
                    emit("COMMITTED " + String.join(",", committed));
                } catch (WakeupException e) {
                    throw e;
                } catch (Exception e) {  // e.g. CommitFailedException after a rebalance: the group goes on
                    emit("COMMIT_FAILED " + oneLine(e));
                }
            }
        } catch (WakeupException e) {
            // stop requested
        } catch (Exception e) {
            emit("ERROR " + oneLine(e));
            status = 1;
        } finally {
            try {
                consumer.close();  // leaves the group (LeaveGroup) unless it is a static member
            } catch (Exception e) {
                emit("ERROR " + oneLine(e));
                status = 1;
            }
            emit("CLOSED");
            closed.countDown();
        }
        System.exit(status);
    }
}
