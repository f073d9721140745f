import java.time.Duration;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A consume-transform-produce loop of Apache Kafka's Java clients with sendOffsetsToTransaction(offsets,
 * consumer.groupMetadata()) (KIP-447: the group's generation and member id go with the offsets).
 *
 * Arguments: bootstrap, group, input topic, output topic, records, transactional id. The consumer subscribes
 * (a classic group member: a real generation), every poll's records become one transaction whose output is
 * "out-<value>". Then two transactions with group metadata that is no longer right: a stale generation and an
 * unknown member id. Lines on stdout: "GENERATION <n>", "COMMITTED <offset>" after each commit,
 * "STALE <exception class>", "UNKNOWN_MEMBER <exception class>", "DONE".
 */
public class TxnLoop {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], input = args[2], output = args[3], txnId = args[5];
        int records = Integer.parseInt(args[4]);
        Properties consumerProps = new Properties();
        consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerProps.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic");
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        producerProps.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps);
             KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps)) {
            producer.initTransactions();
            consumer.subscribe(List.of(input));
            int done = 0;
            long deadline = System.currentTimeMillis() + 120_000;
            while (done < records) {
                if (System.currentTimeMillis() > deadline) {
                    throw new IllegalStateException("only " + done + " records processed");
                }
                ConsumerRecords<String, String> polled = consumer.poll(Duration.ofMillis(500));
                if (polled.isEmpty()) {
                    continue;
                }
                producer.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
                for (ConsumerRecord<String, String> record : polled) {
                    producer.send(new ProducerRecord<>(output, 0, null, "out-" + record.value()));
                    offsets.put(new TopicPartition(record.topic(), record.partition()),
                                new OffsetAndMetadata(record.offset() + 1));
                    done++;
                }
                producer.sendOffsetsToTransaction(offsets, consumer.groupMetadata());
                producer.commitTransaction();
                for (OffsetAndMetadata offset : offsets.values()) {
                    System.out.println("COMMITTED " + offset.offset());
                }
            }
            ConsumerGroupMetadata current = consumer.groupMetadata();
            System.out.println("GENERATION " + current.generationId());
            Map<TopicPartition, OffsetAndMetadata> again =
                Collections.singletonMap(new TopicPartition(input, 0), new OffsetAndMetadata(1));
            System.out.println("STALE " + refused(producer, again, new ConsumerGroupMetadata(
                group, current.generationId() - 1, current.memberId(), Optional.empty())));
            System.out.println("UNKNOWN_MEMBER " + refused(producer, again, new ConsumerGroupMetadata(
                group, current.generationId(), "not-a-member", Optional.empty())));
            System.out.println("DONE");
        }
    }

    private static String refused(KafkaProducer<String, String> producer, Map<TopicPartition, OffsetAndMetadata> offsets,
                                  ConsumerGroupMetadata metadata) {
        producer.beginTransaction();
        try {
            producer.sendOffsetsToTransaction(offsets, metadata);
            producer.commitTransaction();
            return "none";
        } catch (RuntimeException e) {
            producer.abortTransaction();
            return e.getClass().getSimpleName();
        }
    }
}
