#!/bin/bash
grep fail input.txt > out.txt
