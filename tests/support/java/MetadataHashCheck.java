import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.metadata.PartitionRecord;
import org.apache.kafka.common.metadata.RegisterBrokerRecord;
import org.apache.kafka.common.metadata.TopicRecord;
import org.apache.kafka.coordinator.group.Utils;
import org.apache.kafka.coordinator.group.modern.ModernGroup;
import org.apache.kafka.coordinator.group.modern.SubscriptionCount;
import org.apache.kafka.image.MetadataDelta;
import org.apache.kafka.image.MetadataImage;
import org.apache.kafka.image.MetadataProvenance;

/**
 * Kafka 4.1's own metadata hash (ModernGroup.computeMetadataHash, Utils.computeTopicHash) of a metadata image built
 * from tab-separated stdin lines, one case per blank-line-separated block:
 *   broker ID [RACK]                  a registered broker (no rack: one field)
 *   topic UUID NAME R,R,.. R,R,..     a topic, one field per partition: its replicas' broker ids ("" for none)
 *   group NAME NAME ...               prints "group<TAB>hash" for a group subscribed to those names
 *   topic-hash NAME                   prints "topic<TAB>hash"
 */
public class MetadataHashCheck {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        List<String[]> block = new ArrayList<>();
        String line;
        while ((line = in.readLine()) != null) {
            if (line.isEmpty()) {
                run(block);
                block.clear();
            } else {
                block.add(line.split("\t", -1));
            }
        }
        run(block);
        System.out.flush();
    }

    private static void run(List<String[]> block) {
        if (block.isEmpty()) return;
        MetadataDelta delta = new MetadataDelta(MetadataImage.EMPTY);
        for (String[] fields : block) {
            if (fields[0].equals("broker")) {
                delta.replay(new RegisterBrokerRecord()
                    .setBrokerId(Integer.parseInt(fields[1]))
                    .setIncarnationId(Uuid.randomUuid())
                    .setBrokerEpoch(1)
                    .setFenced(false)
                    .setRack(fields.length > 2 ? fields[2] : null));
            } else if (fields[0].equals("topic")) {
                java.util.UUID given = java.util.UUID.fromString(fields[1]);
                Uuid id = new Uuid(given.getMostSignificantBits(), given.getLeastSignificantBits());
                delta.replay(new TopicRecord().setName(fields[2]).setTopicId(id));
                for (int p = 3; p < fields.length; p++) {
                    List<Integer> replicas = new ArrayList<>();
                    for (String r : fields[p].split(",")) {
                        if (!r.isEmpty()) replicas.add(Integer.parseInt(r));
                    }
                    delta.replay(new PartitionRecord().setTopicId(id).setPartitionId(p - 3)
                        .setReplicas(replicas).setIsr(replicas)
                        .setLeader(replicas.isEmpty() ? -1 : replicas.get(0)).setLeaderEpoch(0).setPartitionEpoch(0));
                }
            }
        }
        MetadataImage image = delta.apply(MetadataProvenance.EMPTY);
        for (String[] fields : block) {
            if (fields[0].equals("group")) {
                Map<String, SubscriptionCount> names = new HashMap<>();
                for (int i = 1; i < fields.length; i++) names.put(fields[i], new SubscriptionCount(1, 0));
                System.out.println("group\t" + ModernGroup.computeMetadataHash(names, new HashMap<>(), image));
            } else if (fields[0].equals("topic-hash")) {
                System.out.println("topic\t" + Utils.computeTopicHash(fields[1], image));
            }
        }
    }
}
