#!/bin/bash
mv data.txt answer.txt
