#!/bin/bash
sort records.txt > final.txt
